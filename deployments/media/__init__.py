"""Media out: H.264 in fragmented MP4 for Media Source Extensions, and its remux to a plain MP4."""

from deployments.media.fmp4 import (
    AsyncFragmentEncoder,
    EncodedPiece,
    FragmentedMP4Encoder,
    codec_string,
)
from deployments.media.remux import remux_file, remux_to_mp4

__all__ = [
    "AsyncFragmentEncoder",
    "EncodedPiece",
    "FragmentedMP4Encoder",
    "codec_string",
    "remux_file",
    "remux_to_mp4",
]
