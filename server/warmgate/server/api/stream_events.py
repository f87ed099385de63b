"""How a Generate stream turns its request's step events into messages: what is already queued
goes out together, and with --stream-interval the stream waits for enough tokens."""

from __future__ import annotations

import asyncio

from warmgate.server.serving.request import StepEvent, merge_events


def coalesce(first: StepEvent, queue: asyncio.Queue[StepEvent]
             ) -> tuple[StepEvent, StepEvent | None]:
    """first and every event already queued behind it as one (a reader slower than the
    steps gets all its tokens in its next message, so the queue never grows by more than the
    steps it was away); an error queued behind tokens is returned second, for after them."""
    if first.error is not None or first.finish_reason is not None or queue.empty():
        return first, None
    events = [first]
    while not queue.empty() and events[-1].finish_reason is None:
        event = queue.get_nowait()
        if event.error is not None:
            return merge_events(events), event
        events.append(event)
    return merge_events(events), None


async def gather(first: StepEvent, queue: asyncio.Queue[StepEvent], tokens: int
                 ) -> tuple[StepEvent, StepEvent | None]:
    """first and the events after it, waited for, until they carry `tokens` tokens, finish
    or fail (--stream-interval); an error after tokens is returned second, as coalesce
    does."""
    events = [first]
    have = len(first.token_ids)
    while have < tokens and events[-1].finish_reason is None and events[-1].error is None:
        event = await queue.get()
        if event.error is not None:
            return merge_events(events), event
        events.append(event)
        have += len(event.token_ids)
    return merge_events(events), None
