"""warmgate.v1.Warmup handlers: proto -> one controller call -> proto.

Errors are raised, not handled here: ErrorInterceptor maps them to statuses in one place.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from warmgate.server.api.convert import shared_report_to_proto, status_to_proto
from warmgate.server.control.controller import WarmupController
from warmgate.server.core.errors import ResourceExhausted
from warmgate.server.core.stream_cap import StreamCap
from warmgate.v1 import warmup_pb2 as pb
from warmgate.v1 import warmup_pb2_grpc as pb_grpc


class WarmupService(pb_grpc.WarmupServicer):
    def __init__(self, controller: WarmupController, *, max_watchers: int) -> None:
        self._controller = controller
        self._watchers = StreamCap("WatchStatus", "--max-status-watchers", max_watchers,
                                   "close one or poll GetStatus")

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
        refusal = self._watchers.take()
        if refusal is not None:
            raise ResourceExhausted(refusal)
        try:
            async for snapshot in self._controller.watch(follow=request.follow):
                yield status_to_proto(snapshot)
        finally:
            self._watchers.release()
