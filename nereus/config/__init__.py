"""YAML job configs → checked specs (``Setup``). See docs/config.md for the schema.

``parse_config`` (pure) checks already-parsed data; ``load_config`` reads a file and calls it.
"""

from nereus.config.load import load_config, load_raw, parse_yaml
from nereus.config.schema import EXTENSION_SECTIONS, Config, parse_config

__all__ = ["EXTENSION_SECTIONS", "Config", "load_config", "load_raw", "parse_config", "parse_yaml"]
