"""The data pipeline's jobs; each runs as ``python -m metaq.spark.jobs.<name>`` or through
``spark-submit`` (``--master`` picks any Spark master; ``local[*]`` by default)."""
