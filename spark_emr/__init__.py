"""Cormorant's analytics: PySpark jobs over the broker's own Kafka stream.

- :mod:`spark_emr.jobs.archive`: Kafka → Parquet archive (Structured Streaming,
  ``availableNow``), decoded with the shared record format (:mod:`services.common.records`);
- :mod:`spark_emr.jobs.report`: traffic, fleet and delivery tables from the archive;
- :mod:`spark_emr.render`: the HTML report from those tables (pandas and matplotlib, no Spark);
- :mod:`spark_emr.emr`: the same jobs on EMR Serverless, submitted with boto3;
- :mod:`spark_emr.cli`: ``cormorant analytics archive | report``.

The jobs run the same locally (``local[*]``) and on EMR; nothing here imports a service.
"""
