"""Resource layer: the chip catalog, the cluster and topology model, device discovery.

Imports only `argosy.core` and `argosy.plugins`; vendor APIs live in `backends/` alone.
"""

from argosy.hardware.catalog import Catalog, Chip, default_catalog
from argosy.hardware.cluster import Cluster, ClusterSpec, Node, NodeGroup, NodeGroupSpec
from argosy.hardware.loader import load_cluster, parse_shorthand

__all__ = [
    "Catalog",
    "Chip",
    "Cluster",
    "ClusterSpec",
    "Node",
    "NodeGroup",
    "NodeGroupSpec",
    "default_catalog",
    "load_cluster",
    "parse_shorthand",
]
