"""The write step's spark-submit entry point, shipped inside the package (``ingest_batch.py``): spark-submit runs it
as a script, so it sits alone in this folder (a script's folder comes first on ``sys.path``, and the modules beside
it would shadow installed packages of the same name)."""
