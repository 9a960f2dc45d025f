"""Getting events in: the Kafka producer, the harness SDK, the workload generator, the ingester.

Modules are imported by name (``ingest.producer``, ``ingest.sdk``, ...); this
package imports nothing at load so that ``import ingest.x`` stays cheap.
"""
