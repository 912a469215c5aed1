"""An object behind the `.method.remote(...)` calls code makes of a Ray actor, awaited in this process."""

import asyncio


class LocalActor:
    def __init__(self, target) -> None:
        self.target = target

    def __getattr__(self, name):
        method = getattr(self.target, name)

        class Call:
            @staticmethod
            async def remote(*args):
                out = method(*args)
                return await out if asyncio.iscoroutine(out) else out

        return Call
