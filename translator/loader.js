"use strict";
/* global translatorCore, Cancelled, nextTurn */
/* exported createLoader */

// The pairs' models and the Web Workers that translate with them. A worker made from
// core.js (a blob URL, which works from file://) reads a pair's scripts itself, with
// importScripts, decodes its weights and builds its model, telling the page its progress:
// the page's own thread only draws. Where a worker cannot read the scripts, the page reads
// them (each a short task) and hands the worker their text; where no worker starts at
// all, the page computes itself, in slices.

/**
 * here: the URL of page.js, beside which the data lies; files: {pair: {data, test,
 * bytes}}, the names (with their digests) and the size of each pair's files, as the build
 * wrote them on page.js's element.
 */
function createLoader(here, files) {
  const address = (name) => new URL(name, here).href;
  let worker; // a Worker; null where none starts and the page computes itself
  let pinged; // the promise of the worker's first answer
  let calls = 0;
  const waiting = new Map(); // call id -> {resolve, reject, onStep}
  const loads = new Map(); // pair -> {promise, listeners, last}: its loading
  const readHere = new Map(); // pair -> {data, chunks}: the scripts as the page read them
  const reading = new Map(); // pair -> what the page has read of its scripts so far
  const local = new Map(); // pair -> LanguagePair, where the page computes itself
  const testSets = new Map(); // pair -> its test split, once read
  const running = new WeakMap(); // a run -> the ids of its calls, to cancel them
  let core = null; // translatorCore's names, on the page itself

  /** A Worker running core.js whose answers settle the calls of `table`. */
  function startWorker(table) {
    try {
      const source = `(${translatorCore.toString()})(self);\n`;
      const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
      const started = new Worker(url);
      started.onmessage = ({ data: message }) => {
        const call = table.get(message.id);
        if (!call) {
          return;
        }
        if (message.step !== undefined) {
          call.onStep?.(message.step);
          return;
        }
        table.delete(message.id);
        if (message.error) {
          call.reject(new Error(message.error));
        } else if (message.cancelled) {
          call.reject(new Cancelled());
        } else {
          call.resolve(message.result ?? message.ready);
        }
      };
      // A worker that fails to run (its script refused, say) fails every call waiting.
      started.onerror = (event) => {
        event.preventDefault();
        for (const call of table.values()) {
          call.reject(new Error(event.message || "the worker stopped"));
        }
        table.clear();
      };
      return started;
    } catch {
      return null; // a page that forbids workers: compute here
    }
  }

  /** Ask `target` (a worker) for `message`: a promise of its answer. */
  function ask(target, table, message, { onStep = null, run = null } = {}) {
    const id = ++calls;
    if (run) {
      running.set(run, (running.get(run) ?? new Set()).add(id));
    }
    return new Promise((resolve, reject) => {
      table.set(id, { resolve, reject, onStep });
      target.postMessage({ ...message, id });
    });
  }

  /** A worker that answers, once it has warmed up (or false where none starts). */
  function workerReady() {
    if (worker === undefined) {
      worker = startWorker(waiting);
      pinged = (worker ? ask(worker, waiting, { ping: true }) : Promise.reject()).then(
        () => true,
        () => {
          worker?.terminate();
          worker = null;
          return false;
        },
      );
    }
    return pinged;
  }

  function loadScript(url) {
    return new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = url;
      script.onload = resolve;
      script.onerror = () => reject(new Error(`cannot load ${url}`));
      document.head.append(script);
    });
  }

  /** The pair's scripts read by the page itself: {data, chunks (base64)}. */
  async function readScripts(pair, progress) {
    if (!readHere.has(pair)) {
      const found = { data: null, chunks: [] };
      reading.set(pair, found);
      window.translatorData = (data) => (reading.get(data.pair).data = data);
      window.translatorWeights = (of, index, text) => (reading.get(of).chunks[index] = text);
      const { bytes } = files[pair];
      await loadScript(address(files[pair].data));
      const listed = found.data.weights.chunks;
      let loaded = bytes - listed.reduce((sum, chunk) => sum + chunk.bytes, 0);
      progress({ loaded, total: bytes });
      for (const chunk of listed) {
        await loadScript(address(chunk.src));
        loaded += chunk.bytes;
        progress({ loaded, total: bytes });
      }
      reading.delete(pair);
      readHere.set(pair, found);
    }
    return readHere.get(pair);
  }

  /** The message that loads the pair in a worker: its address, or what the page read. */
  const loadMessage = (pair) =>
    readHere.has(pair)
      ? { load: pair, ...readHere.get(pair) }
      : { load: pair, url: address(files[pair].data), bytes: files[pair].bytes };

  async function startPair(pair, progress) {
    if (await workerReady()) {
      try {
        return await ask(worker, waiting, loadMessage(pair), { onStep: progress });
      } catch (error) {
        if (readHere.has(pair)) {
          throw error;
        }
        // the worker could not read the scripts: the page reads them and hands them over
        await readScripts(pair, progress);
        return ask(worker, waiting, loadMessage(pair));
      }
    }
    const { data, chunks } = await readScripts(pair, progress);
    core ??= translatorCore(null);
    await nextTurn(); // let the status show before the page is busy
    const made = core.loadPair(null, { load: pair, data, chunks });
    local.set(pair, made);
    return made.summary();
  }

  /**
   * The pair's model, ready to translate (loaded once): a promise of its summary (see
   * LanguagePair.summary). progress({loaded, total}), if given, hears how far its files
   * are read, in bytes.
   */
  function load(pair, progress = null) {
    if (!loads.has(pair)) {
      const entry = { listeners: new Set(), last: null };
      const tell = (step) => {
        const read = (told) => Boolean(told) && told.loaded >= told.total;
        if (read(step) && !read(entry.last)) {
          performance.mark(`translator: ${pair} loaded`); // read, not yet built
        }
        entry.last = step;
        entry.listeners.forEach((listener) => listener(step));
      };
      entry.promise = startPair(pair, tell).then(
        (summary) => {
          performance.mark(`translator: ${pair} ready`);
          return summary;
        },
        (error) => {
          loads.delete(pair); // a later attempt starts over
          throw error;
        },
      );
      loads.set(pair, entry);
    }
    const entry = loads.get(pair);
    if (progress) {
      entry.listeners.add(progress);
      if (entry.last) {
        progress(entry.last);
      }
    }
    return entry.promise;
  }

  /**
   * A work of the model: in the worker (`message`), or on the page itself, in slices, where
   * no worker runs (`here(LanguagePair)` gives its generator). Either way it stops when
   * `run` is stopped.
   */
  function compute(run, message, onStep, here) {
    if (worker) {
      return ask(worker, waiting, message, { onStep, run });
    }
    return core.drive(here(local.get(message.pair)), () => run.cancelled, onStep);
  }

  /** Stop the works of `run` (its `cancelled` set by its owner). */
  function stop(run) {
    for (const id of running.get(run) ?? []) {
      worker?.postMessage({ cancel: id });
    }
  }

  /** The pair's test split (read once). */
  async function testSet(pair) {
    if (!testSets.has(pair)) {
      window.translatorTestSet = (data) => testSets.set(data.pair, data);
      await loadScript(address(files[pair].test));
    }
    return testSets.get(pair);
  }

  /**
   * `count` new workers with the pair's model, each reading it itself: {size, ask(index,
   * message), close()}. Closing ends them, and fails the calls still waiting.
   */
  async function team(pair, count) {
    const table = new Map();
    const members = [];
    const close = () => {
      members.forEach((w) => w.terminate());
      for (const call of table.values()) {
        call.reject(new Cancelled());
      }
      table.clear();
    };
    for (let i = 0; i < count; i++) {
      const started = startWorker(table);
      if (!started) {
        close();
        throw new Error("no worker could start: the score needs them");
      }
      members.push(started);
    }
    try {
      await Promise.all(members.map((w) => ask(w, table, loadMessage(pair))));
    } catch (error) {
      close();
      throw error;
    }
    return {
      size: members.length,
      ask: (index, message) => ask(members[index], table, message),
      close,
    };
  }

  return {
    load,
    compute,
    stop,
    testSet,
    team,
    /** The size of the pair's files, in bytes. */
    bytes: (pair) => files[pair].bytes,
    /** Whether the page computes itself, no worker having started. */
    onPage: () => worker === null,
  };
}
