"""`rtc`: real-time chunking. Continuity is made on the policy side, so the fuser only aligns.

While a chunk is computed the arm keeps executing the current plan. The runtime hands that plan to the
policy (`predict_action_chunk(batch, prefix_actions=..., inference_delay=...)`), which inpaints the new
chunk so that its first `inference_delay` actions equal the ones being executed and the rest continues
from them. The arriving chunk is then switched to at once, sampled at the current time like `naive`.
Policies without prefix inpainting get plain `naive` behaviour (the runtime warns).
"""

from __future__ import annotations

from worldloop.real_robot.fusion.naive import NaiveFuser


class RTCFuser(NaiveFuser):
    wants_prefix = True
