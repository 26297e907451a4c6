"""The drafter pool, one Serve application: its replicas (``server``), how a verifier reaches them (``client``),
where Serve routes a verifier's ``attach`` (``router``) and how the pool grows and shrinks (``autoscaling``)."""
