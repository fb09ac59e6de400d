# phasegate as a Nomad system job: one daemon per client node, checked by
# Nomad's native service provider over HTTP.
#
# The port answers within milliseconds of start, with 503 while the daemon
# reclaims leaked namespaces and fills its pool, so the check says "starting",
# never "connection refused". check_restart's grace covers a slow reclaim on a
# dirty host; kill_timeout covers the drain delay plus the stop timeout.
#
# Nomad's native provider runs only http and tcp checks; for the gRPC check
# use the Consul variant, phasegate-consul.nomad.hcl.
job "phasegate" {
  type = "system"

  group "phasegate" {
    network {
      port "api" {
        static = 5008
      }
    }

    service {
      name     = "phasegate"
      provider = "nomad"
      port     = "api"

      check {
        name     = "phasegate-health"
        type     = "http"
        path     = "/health"
        interval = "5s"
        timeout  = "2s"

        check_restart {
          limit = 3
          # A reclaim of thousands of leaked namespaces takes seconds, not
          # the tens of minutes of a serial one; keep a wide margin anyway.
          grace           = "10m"
          ignore_warnings = false
        }
      }
    }

    task "phasegate" {
      # raw_exec: the daemon needs the host's network namespace and mounts.
      driver = "raw_exec"

      config {
        command = "/usr/local/bin/phasegate"
        args = [
          "serve",
          "--listen=${NOMAD_IP_api}:5008",
          "--state-dir=/run/phasegate",
          "--drain-delay=5s",
          "--stop-timeout=10s",
        ]
      }

      # drain delay (5s) + stop timeout (10s) + margin.
      kill_timeout = "20s"
      kill_signal  = "SIGTERM"

      env {
        OTEL_TRACES_EXPORTER = "none"
      }

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }
}
