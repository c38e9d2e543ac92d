"""Configuration: the schema (``config.schema``), and loading with interpolation (``config.loader``).

Example files live beside this module: ``walflow.yaml`` (the default ``WALFLOW_CONFIG``)
and ``examples/``.
"""

from config.loader import ConfigError, config_path, load_config, parse_config
from config.schema import Config, DatabaseConfig, NatsDestination, SinkConfig, WalflowSettings

__all__ = [
    "Config",
    "ConfigError",
    "DatabaseConfig",
    "NatsDestination",
    "SinkConfig",
    "WalflowSettings",
    "config_path",
    "load_config",
    "parse_config",
]
