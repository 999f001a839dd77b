// ESLint for the page translator's JavaScript (make check): translator/ runs in the browser
// and in a Web Worker as classic scripts that share one scope (the build joins them, see
// _ext/translator.py); tests/*.js runs in Node.
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["node_modules/", "_build/", ".venv/"] },
  {
    files: ["translator/**/*.js"],
    ...js.configs.recommended,
    languageOptions: {
      ecmaVersion: 2024,
      sourceType: "script",
      globals: { ...globals.browser, ...globals.worker },
    },
    rules: {
      ...js.configs.recommended.rules,
      strict: ["error", "global"],
      "no-var": "error",
      "prefer-const": "error",
      eqeqeq: "error",
      // no HTML from strings: what a reader types is text (house style, rule 25)
      "no-restricted-properties": [
        "error",
        { property: "innerHTML", message: "Use textContent." },
        { property: "outerHTML", message: "Use textContent." },
        { property: "insertAdjacentHTML", message: "Use textContent." },
      ],
    },
  },
  {
    files: ["tests/**/*.js"],
    ...js.configs.recommended,
    languageOptions: { ecmaVersion: 2024, sourceType: "commonjs", globals: globals.node },
    rules: { ...js.configs.recommended.rules, strict: ["error", "global"], eqeqeq: "error" },
  },
];
