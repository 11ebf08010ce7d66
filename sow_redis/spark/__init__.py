"""The data pipeline on Spark (PySpark, the ``spark`` extra): bulk loads into the SOW through the
workers' own apply path (issue 11; ARCHITECTURE §7). Importing :mod:`sow_redis` never needs
pyspark; these modules import it when used.

* :mod:`.session`: a local (or ``--master``) SparkSession;
* :mod:`.load`: ``sow-redis spark load``;
* :mod:`.chains`: ``sow-redis spark resolve-chains`` (pointer jumping; run by loads of
  chaining topics);
* :mod:`.stream`: ``sow-redis spark stream``;
* :mod:`.snapshot`: ``sow-redis spark export`` and ``sow-redis spark sql``;
* :mod:`.archive`: ``sow-redis spark archive`` and ``sow-redis spark rebuild``.
"""
