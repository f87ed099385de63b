"""warmgate.v1.Warmup handlers: proto -> one controller call -> proto.

Errors are raised, not handled here: ErrorInterceptor maps them to statuses in one place.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from warmgate.server.api.convert import shared_report_to_proto, status_to_proto
from warmgate.server.control.controller import WarmupController
from warmgate.server.core.errors import ResourceExhausted
from warmgate.v1 import warmup_pb2 as pb
from warmgate.v1 import warmup_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)


class WarmupService(pb_grpc.WarmupServicer):
    def __init__(self, controller: WarmupController, *, max_watchers: int) -> None:
        self._controller = controller
        # Open WatchStatus streams; only the event loop touches them, so no lock.
        self._watchers = 0
        self._max_watchers = max_watchers
        self._refusing = False  # logged once per stretch at the cap, not once per refusal

    async def WarmupKernels(
            self, request: pb.WarmupKernelsRequest,
            context: grpc.aio.ServicerContext[pb.WarmupKernelsRequest, pb.WarmupReport],
    ) -> pb.WarmupReport:
        mixed = request.mixed_num_tokens if request.HasField("mixed_num_tokens") else None
        shared = await self._controller.warmup_kernels(force=request.force,
                                                       mixed_num_tokens=mixed)
        return shared_report_to_proto(shared)

    async def MixedWarmup(
            self, request: pb.MixedWarmupRequest,
            context: grpc.aio.ServicerContext[pb.MixedWarmupRequest, pb.WarmupReport],
    ) -> pb.WarmupReport:
        shared = await self._controller.mixed_warmup(request.num_tokens, force=request.force)
        return shared_report_to_proto(shared)

    async def GetStatus(
            self, request: pb.GetStatusRequest,
            context: grpc.aio.ServicerContext[pb.GetStatusRequest, pb.WarmupStatus],
    ) -> pb.WarmupStatus:
        return status_to_proto(self._controller.status())

    async def WatchStatus(
            self, request: pb.WatchStatusRequest,
            context: grpc.aio.ServicerContext[pb.WatchStatusRequest, pb.WarmupStatus],
    ) -> AsyncIterator[pb.WarmupStatus]:
        self._take_watch_slot()
        try:
            async for snapshot in self._controller.watch(follow=request.follow):
                yield status_to_proto(snapshot)
        finally:
            self._watchers -= 1
            if self._refusing and self._watchers < self._max_watchers:
                self._refusing = False
                logger.info("WatchStatus below its cap again: %d of %d streams open",
                            self._watchers, self._max_watchers)

    def _take_watch_slot(self) -> None:
        """Count one more open watch, or refuse it at --max-status-watchers: every watch
        holds memory and gets a message per status change, on the loop health answers on."""
        if self._watchers >= self._max_watchers:
            if not self._refusing:
                self._refusing = True
                logger.warning("WatchStatus at its cap: %d streams open "
                               "(--max-status-watchers %d); refusing new ones until one closes",
                               self._watchers, self._max_watchers)
            raise ResourceExhausted(
                f"{self._watchers} WatchStatus streams are open, the most this server allows "
                f"(--max-status-watchers {self._max_watchers}); close one or poll GetStatus")
        self._watchers += 1
