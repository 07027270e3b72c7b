"""Structured Streaming jobs that land Danube topics in Delta tables exactly once.

A pipeline is a YAML file (`conf/pipelines/*.yaml`, parsed by `pipelines.config.load_config`);
`pipelines.runner.PipelineRunner` runs it: the `danube` source -> decode (raw / JSON / Avro,
schemas from Danube's registry) -> great-expectations -> Delta target + quarantine with
idempotent writes -> subscription cursor in etcd. Nothing heavy is imported here, so reading a
config file does not start Spark.
"""
