"""A worker rank's program (`python -m warmgate.server.distributed.worker`): see __main__."""
