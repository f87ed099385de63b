"""Overlapped scheduling on the runner side: a step's sampled tokens stay on the device until
the host asks for them, and the next step reads them there.

vLLM's async scheduling, trimmed. `launch` samples a step without reading the tokens back: it
appends PLACEHOLDER to each sampling request's outputs (so positions, seeded streams and the
next step's input lengths are already right), starts a non-blocking copy of the tokens into a
pinned host buffer and records a CUDA event. The next step's inputs are built on the host with
the placeholders in them; `fill_inputs` then writes the device tokens over those rows of the
persistent input_ids buffer (an index_copy_ queued before the forward or the graph replay).
`AsyncModelOutput.get` waits for the event (the step's one sync) and puts the real tokens in
place of the placeholders. On the CPU the same code runs; the copy has simply happened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from warmgate.server.runner.host_copy import to_device
from warmgate.server.runner.input_batch import StepInputs
from warmgate.server.runner.request_state import PLACEHOLDER, RequestState, ScheduledRequest
from warmgate.server.runner.sampling.logprobs import logprob_table, read_logprob_table
from warmgate.server.runner.scheduler_output import ModelRunnerOutput, TokenLogprobs


class AsyncModelOutput:
    """A launched step's ModelRunnerOutput, ready once its tokens are on the host.

    sync_reason is None when the step was sampled without waiting for the device; otherwise
    why it was sampled on the host at once (its output is then complete already)."""

    def __init__(self, output: ModelRunnerOutput | None = None, sync_reason: str | None = None,
                 *, req_ids: Sequence[str] = (), sampling: Sequence[RequestState] = (),
                 host: torch.Tensor | None = None, event: torch.cuda.Event | None = None,
                 template: ModelRunnerOutput | None = None,
                 logprobs: tuple[torch.Tensor, list[tuple[int, int]]] | None = None) -> None:
        self._output = output
        self.sync_reason = sync_reason
        self._req_ids = list(req_ids)
        self._sampling = list(sampling)
        self._host = host
        self._event = event
        self._template = template
        # logprob_table's rows on the host once the event passed, and per row the request
        # (its index among the sampling ones) and its number of top logprobs.
        self._logprobs = logprobs

    def get(self) -> ModelRunnerOutput:
        """The step's output; the first call waits for its tokens (the step's one sync) and
        puts them into the requests' states in place of the placeholders."""
        if self._output is not None:
            return self._output
        if self._event is not None:
            self._event.synchronize()
        assert self._host is not None and self._template is not None  # set with no output
        tokens = self._host.tolist()
        for state, token in zip(self._sampling, tokens, strict=True):
            # The older of the last two: the next step may have been launched (and left its
            # own placeholder, or a token sampled on the host) already.
            out = state.output_token_ids
            out[-2 if len(out) > 1 and out[-2] == PLACEHOLDER else -1] = token
        by_req = {s.req_id: [t] for s, t in zip(self._sampling, tokens, strict=True)}
        lp_by_req: dict[str, list[TokenLogprobs]] | None = None
        if self._logprobs is not None:
            table, wanted = self._logprobs
            entries = read_logprob_table(table.tolist(), [tokens[i] for i, _ in wanted],
                                         [n for _, n in wanted])
            lp_by_req = {self._sampling[i].req_id: [e]
                         for (i, _), e in zip(wanted, entries, strict=True)}
        t = self._template
        self._output = ModelRunnerOutput(
            req_ids=self._req_ids,
            sampled_token_ids=[by_req.get(r, []) for r in self._req_ids],
            num_accepted_draft_tokens=[0] * len(self._req_ids),
            logprobs=None if lp_by_req is None else [lp_by_req.get(r, [])
                                                     for r in self._req_ids],
            prompt_logprobs=t.prompt_logprobs)
        self._host = None
        return self._output


class DeviceTokens:
    """The last launched step's sampled tokens on the device, and the pinned host buffers
    they are copied into (two: step N's is read after step N+1's copy was queued)."""

    def __init__(self, max_num_reqs: int, device: torch.device,
                 log_softmax: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """log_softmax: the logprobs' normaliser (the runner's ops'; None: torch's)."""
        self.device = device
        self._log_softmax = log_softmax
        pin = device.type == "cuda"
        self._host = [torch.zeros(max_num_reqs, dtype=torch.int64, pin_memory=pin)
                      for _ in range(2)]
        self._slot = 0
        # [sampling requests] int64, on the device; each request's RequestState.device_row.
        self._tokens: torch.Tensor | None = None
        if pin:  # fill_inputs' two kernels load now (CUDA lazy loading), not at a request
            rows = torch.zeros(1, dtype=torch.int64, device=device)
            # A separate destination: index_copy_ refuses to write into its own index.
            torch.zeros_like(rows).index_copy_(0, rows, rows.index_select(0, rows))

    def launch(self, tokens: torch.Tensor, scheduled: Sequence[ScheduledRequest],
               template: ModelRunnerOutput, logits: torch.Tensor) -> AsyncModelOutput:
        """tokens [R]: one per sampling request of `scheduled` (in order), still on the
        device; logits [R, V] their rows. Appends the placeholders and starts the copies to
        the host: the tokens, and the logprobs of the requests that asked."""
        sampling = [s.state for s in scheduled if s.num_logits_rows]
        for i, state in enumerate(sampling):
            state.output_token_ids.append(PLACEHOLDER)
            state.device_row = i
        self._tokens = tokens
        host = self._host[self._slot][:len(sampling)]
        self._slot ^= 1
        host.copy_(tokens, non_blocking=True)
        wanted = [(i, state.sampling_params.logprobs) for i, state in enumerate(sampling)
                  if state.sampling_params is not None
                  and state.sampling_params.logprobs is not None]
        table = None
        if wanted:  # gathered for the device's tokens, read with them
            rows = to_device([i for i, _ in wanted], torch.long, tokens.device)
            on_device = logprob_table(logits, rows, tokens.index_select(0, rows),
                                      max(n for _, n in wanted), self._log_softmax)
            table = torch.empty(on_device.shape, dtype=on_device.dtype,
                                pin_memory=self.device.type == "cuda")
            table.copy_(on_device, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return AsyncModelOutput(req_ids=[s.req_id for s in scheduled], sampling=sampling,
                                host=host, event=event, template=template,
                                logprobs=(table, wanted) if table is not None else None)

    def fill_inputs(self, inputs: StepInputs) -> int:
        """Write the device tokens into this step's input rows that hold a placeholder (a
        request whose last token the host does not have yet), which prepare_inputs listed
        and sent with the step's inputs. Returns the rows written."""
        n = inputs.num_pending
        if self._tokens is None or not n:
            return 0
        pending, cap = inputs.views.pending.gpu, inputs.views.num_reqs
        inputs.input_ids.index_copy_(0, pending[:n], self._tokens.index_select(
            0, pending[cap:cap + n]))
        return n
