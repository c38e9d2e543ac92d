"""The ``walflow`` command (installed into ``.venv/bin`` by ``./run.sh setup``)."""
