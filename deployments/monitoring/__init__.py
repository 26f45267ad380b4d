"""What the service tells its operators: metrics for Ray's export, the Grafana dashboard over them,
and the one access-log line per request.
"""
