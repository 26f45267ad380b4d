# Ray and Serve settings for the service's processes, sourced by scripts/run.sh and scripts/env.sh (and read by
# the benchmarks that start `serve run`, scripts/bench/common.py): each is exported unless already set. They must
# be in the environment of `serve run` itself (Serve's controller, proxy and Ray's log monitor inherit it);
# on a cluster, `source scripts/env.sh` before `ray start` on each node.
#
# On a CPU machine the decoder's llama.cpp threads take every core and wait for each other at each step, so
# any other process that runs costs both cores: a 2,000-token prompt takes 1.2x as long to read through Serve
# as in the engine alone on 2 cores. The idle service used 30% of one core (Serve's control loop ten times a
# second, each replica's and handle's metrics ten times a second, Ray's log monitor); with the three settings
# below, 20%: the rest is about 1% for each Ray process (docs/benchmarks.md, "Long prompts and the KV layout").

# Serve's controller loop (autoscaling, health checks, deploys) 2 times a second, not 10
export RAY_SERVE_CONTROL_LOOP_INTERVAL_S="${RAY_SERVE_CONTROL_LOOP_INTERVAL_S:-0.5}"
# Serve's request metrics (ray_serve_*) handed to Ray's exporter each second, not each 0.1 s
export RAY_SERVE_METRICS_EXPORT_INTERVAL_MS="${RAY_SERVE_METRICS_EXPORT_INTERVAL_MS:-1000}"
# Ray's log monitor looks for new log files every 5 s, not 0.5 s (lines of known files still come at once)
export LOG_NAME_UPDATE_INTERVAL_S="${LOG_NAME_UPDATE_INTERVAL_S:-5}"
# Ray's "taken more than 30s to initialize" warning: five replicas importing torch at once on a small CPU
# machine take about that long; warn after 120 s (whole seconds: Ray reads an int)
export RAY_SERVE_SLOW_STARTUP_WARNING_S="${RAY_SERVE_SLOW_STARTUP_WARNING_S:-120}"
# ...and repeat it every 5 minutes, not every 30 s: a captioner that cannot load waits in its constructor,
# retrying in place (Serve shows it STARTING, never HEALTHY), and says why once per attempt itself
export RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S="${RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S:-300}"
