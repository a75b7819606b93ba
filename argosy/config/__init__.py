"""The one config model: a pydantic tree assembled from each layer's section.

Loading order: YAML file, then environment (`ARGOSY__SECTION__FIELD=value`), then
`--set section.field=value`. The result is validated once and frozen; unknown keys are
errors that point at the file line, the variable or the `--set` that introduced them.
"""

from argosy.config.loader import load_config
from argosy.config.model import PlatformConfig

__all__ = ["PlatformConfig", "load_config"]
