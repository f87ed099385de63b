"""The sampler on its own (synthetic logits) and through the runner (seeded requests)."""

from __future__ import annotations

import torch

from tests.runner_helpers import MiniScheduler, make_runner, prompt
from warmgate.server.runner.sampling import Sampler, SeededStream, make_generator
from warmgate.server.runner.sampling.warpers import probabilities
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams

V = 64


def logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_draws_no_random_numbers() -> None:
    x = logits(5)
    state = torch.get_rng_state()
    out = Sampler().sample(x, [GREEDY] * 5, [None] * 5)
    assert torch.equal(torch.get_rng_state(), state)  # the fast path touched no RNG
    assert torch.equal(out, x.argmax(dim=-1))


def test_top_k_one_is_greedy() -> None:
    x = logits(8, seed=1)
    params = [SamplingParams(temperature=1.3, top_k=1)] * 8
    for _ in range(5):
        assert torch.equal(Sampler().sample(x, params, [None] * 8), x.argmax(dim=-1))


def test_mixed_greedy_and_stochastic_rows() -> None:
    x = logits(4, seed=2)
    params = [GREEDY, SamplingParams(temperature=1.0), GREEDY, SamplingParams(top_k=3)]
    out = Sampler().sample(x, params, [None] * 4)
    assert out[0] == x[0].argmax() and out[2] == x[2].argmax()
    assert out[3] in x[3].topk(3).indices


def test_top_p_keeps_the_nucleus() -> None:
    # Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the first two (0.5 < 0.7 <= 0.8).
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    x = probs.log()
    params = [SamplingParams(temperature=1.0, top_p=0.7)]
    seen = {int(Sampler().sample(x, params, [None])[0]) for _ in range(300)}
    assert seen == {0, 1}
    kept = probabilities(x, params)[0]
    torch.testing.assert_close(kept, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_top_p_one_keeps_everything() -> None:
    x = torch.zeros(1, V)
    kept = probabilities(x, [SamplingParams(top_p=1.0)])
    assert (kept > 0).all()


def test_sampling_follows_the_distribution() -> None:
    torch.manual_seed(0)
    probs = torch.tensor([0.6, 0.3, 0.1])
    x = probs.log().expand(4000, 3).contiguous()
    out = Sampler().sample(x, [SamplingParams()] * 4000, [None] * 4000)
    freq = torch.bincount(out, minlength=3).float() / 4000
    torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)


def test_seeded_rows_do_not_depend_on_batch_companions() -> None:
    x = logits(6, seed=3)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = Sampler().sample(x[2:3], [seeded], [SeededStream(42, 0)])
    for companions in ([GREEDY, SamplingParams()], [SamplingParams(top_k=5)] * 4):
        rows = [*companions[:1], seeded, *companions[1:]]
        gens = [None, SeededStream(42, 0)] + [None] * (len(rows) - 2)
        batch = torch.cat([x[:1], x[2:3], x[3:3 + len(rows) - 2]])
        assert Sampler().sample(batch, rows, gens)[1] == alone[0]


def test_generator_depends_on_seed_and_step() -> None:
    draws = {(s, n): torch.rand(4, generator=make_generator(s, n, torch.device("cpu")))
             for s in (1, 2) for n in (0, 1)}
    assert len({tuple(v.tolist()) for v in draws.values()}) == 4
    again = torch.rand(4, generator=make_generator(1, 1, torch.device("cpu")))
    assert torch.equal(again, draws[(1, 1)])


def test_verify_greedy_accepts_matching_prefix() -> None:
    x = logits(4, seed=4)  # 3 drafts + bonus row
    best = x.argmax(dim=-1).tolist()
    tokens, accepted = Sampler().verify(x, [best[:3]], [GREEDY], [None])
    assert tokens == [best] and accepted == [3]
    wrong = (best[1] + 1) % V
    tokens, accepted = Sampler().verify(x, [[best[0], wrong, best[2]]], [GREEDY], [None])
    assert tokens == [[best[0], best[1]]] and accepted == [1]


def test_verify_emits_what_sample_draws_at_each_position() -> None:
    # A seeded request at output positions 5..8: 3 draft rows and the bonus row.
    x = logits(4, seed=6)
    seeded = SamplingParams(temperature=1.0, seed=9)
    per_position = [Sampler().sample(x[j:j + 1], [seeded], [SeededStream(9, 5 + j)]).item()
                    for j in range(4)]
    tokens, accepted = Sampler().verify(x, [per_position[:3]], [seeded], [SeededStream(9, 5)])
    assert tokens == [per_position] and accepted == [3]
    wrong = (per_position[1] + 1) % V
    tokens, accepted = Sampler().verify(x, [[per_position[0], wrong, per_position[2]]],
                                        [seeded], [SeededStream(9, 5)])
    assert tokens == [per_position[:2]] and accepted == [1]


def test_verify_stochastic_is_distributed_as_the_target() -> None:
    # One draft d=0 under target p: the first emitted token must still follow p.
    torch.manual_seed(1)
    p = torch.tensor([0.2, 0.5, 0.3])
    n = 3000
    x = p.log().expand(2 * n, 3).contiguous()
    tokens, accepted = Sampler().verify(x, [[0]] * n, [SamplingParams()] * n, [None] * n)
    first = torch.tensor([t[0] for t in tokens])
    freq = torch.bincount(first, minlength=3).float() / n
    torch.testing.assert_close(freq, p, atol=0.03, rtol=0)
    assert abs(sum(accepted) / n - 0.2) < 0.03


def _seeded_run(companions: int, seed: int = 1234) -> list[int]:
    runner = make_runner()
    sched = MiniScheduler(runner)
    for i in range(companions):
        sched.add(f"other{i}", prompt(4 + i, offset=50 + i), SamplingParams(temperature=1.0))
    sched.add("seeded", prompt(6, offset=1), SamplingParams(temperature=1.0, seed=seed))
    for _ in range(6):
        sched.step()
    return sched.tokens("seeded")


def test_seeded_requests_through_the_runner_ignore_companions() -> None:
    alone = _seeded_run(0)
    assert _seeded_run(2) == alone
    assert _seeded_run(3) == alone
    assert _seeded_run(0, seed=99) != alone


def test_runner_greedy_equals_argmax_of_its_logits() -> None:
    runner = make_runner()
    sched = MiniScheduler(runner)
    sched.add("g", prompt(5))
    for _ in range(3):
        out = sched.step()
        assert out is not None and runner.last_logits is not None
        assert out.sampled_token_ids == [[int(runner.last_logits[0].argmax())]]
