"""The built-in flow-matching vision-language-action policy."""

from worldloop.vla.flow_vla.configuration_flow_vla import FlowVLAConfig, LanguageConfig, VisionConfig
from worldloop.vla.flow_vla.modeling_flow_vla import FlowVLAPolicy

__all__ = ["FlowVLAConfig", "FlowVLAPolicy", "LanguageConfig", "VisionConfig"]
