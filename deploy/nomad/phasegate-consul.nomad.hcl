# phasegate as a Nomad system job registered in Consul, with a gRPC health
# check: Nomad's native provider cannot run grpc checks, Consul's can.
# grpc_service = "" asks for the daemon's overall readiness.
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
      provider = "consul"
      port     = "api"

      check {
        name            = "phasegate-grpc"
        type            = "grpc"
        port            = "api"
        grpc_service    = ""
        grpc_use_tls    = false
        interval        = "5s"
        timeout         = "2s"

        check_restart {
          limit           = 3
          grace           = "10m"
          ignore_warnings = false
        }
      }

      check {
        name     = "phasegate-health"
        type     = "http"
        path     = "/health"
        interval = "5s"
        timeout  = "2s"
      }
    }

    task "phasegate" {
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

      kill_timeout = "20s"
      kill_signal  = "SIGTERM"

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }
}
