"""Eagle Cluster's composition layer: it composes ``actors/`` into something people run (``actors`` never imports
from here)."""
