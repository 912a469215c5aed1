"""The wire protocol (PROTOCOL.md): message models, validation and error texts, shared by the endpoints.

Pure Python with pydantic: no Ray, no sockets, no torch, so it is tested on its own.
"""

from deployments.protocol.errors import ProtocolError, error_message

__all__ = ["ProtocolError", "error_message"]
