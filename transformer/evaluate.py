# Generated from chapters/15_results.ipynb: edit it, not this file.
"""Scoring translations: sacreBLEU's BLEU and chrF with their signatures (Post,
2018), and the lowercased tokenised BLEU of published Multi30k results."""

# %% auto #0
__all__ = ["Scores", "score"]

# %% ../chapters/15_results.ipynb #ef74895a

from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from transformer.splits import LC_TOK_BLEU, lc_tok_bleu


@dataclass(frozen=True)
class Scores:
    """Corpus scores in percent, with their signatures: sacreBLEU's BLEU, its
    length ratio and brevity penalty, chrF, and the published results' BLEU."""

    sentences: int
    bleu: float
    chrf: float
    length_ratio: float
    brevity_penalty: float
    bleu_lc_tok: float
    bleu_signature: str
    chrf_signature: str
    bleu_lc_tok_signature: str

    def report(self) -> str:
        """The scores with their signatures, one per line."""
        lc_tok = (
            f"{LC_TOK_BLEU}, only to compare with published Multi30k results"
        )
        return (
            f"sacreBLEU {self.bleu:6.2f}  {self.bleu_signature}\n"
            f"          (output/reference length {self.length_ratio:.3f},"
            f" brevity penalty {self.brevity_penalty:.3f})\n"
            f"chrF      {self.chrf:6.2f}  {self.chrf_signature}\n"
            f"{lc_tok}: {self.bleu_lc_tok:.2f}  {self.bleu_lc_tok_signature}"
        )


# %% ../chapters/15_results.ipynb #c2b90acb
def score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    language: str = "en",
) -> Scores:
    """sacreBLEU's BLEU and chrF of detokenised translations against the raw
    references (one per sentence), and the lowercased spaCy-tokenised BLEU;
    `language`: the references'."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("score takes sequences of sentences, not one string")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} translations but {len(references)} references"
        )
    if not references:
        raise ValueError("no sentences to score")
    hypotheses, references = list(hypotheses), list(references)
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    lc_tok, lc_tok_signature = lc_tok_bleu(hypotheses, references, language)
    return Scores(
        sentences=len(references),
        bleu=bleu_score.score,
        chrf=chrf_score.score,
        length_ratio=bleu_score.ratio,
        brevity_penalty=bleu_score.bp,
        bleu_lc_tok=lc_tok,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        bleu_lc_tok_signature=lc_tok_signature,
    )
