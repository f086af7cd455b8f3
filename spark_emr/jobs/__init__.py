"""The Spark jobs: each module has a ``run`` function taking a SparkSession (what the local
commands call) and a ``main`` for ``spark-submit`` (the EMR Serverless entry point)."""
