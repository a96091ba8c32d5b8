"""Media shared by the platform adapters (issue 12): what an adapter announces
(``InboundMedia``), capped downloads, MIME sniffing, storing under the workspace inbox,
and the per-platform upload limits for files out."""

from channels.media.model import InboundMedia, MediaTooLarge

__all__ = ["InboundMedia", "MediaTooLarge"]
