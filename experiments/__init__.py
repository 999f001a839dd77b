"""The analysis of the book's own training runs: scripts that train, score and compare them,
and the comparison runs' metrics under runs/ (experiments/README.md lists them)."""
