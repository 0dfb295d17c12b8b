"""The acrostic rule of data/tangshi/poems.py as lm-evaluation-harness's metric of tangshi_acrostic.yaml
(its process_results): lm-eval imports this file by its path, beside the YAML."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.tangshi.poems import score_acrostic  # noqa: E402


def process_results(doc, results):
    """One answer's scores: hits, the share of its key's characters that begin their 句; one_length, 1 where
    every 句 has one length, 5 or 7; whole, 1 where it has as many 句 as the key has characters."""
    score = score_acrostic(doc["key"], results[0])
    return {"hits": score["hits"] / len(doc["key"]), "one_length": float(score["one_length"]),
            "whole": float(score["whole"])}
