# phasegate as a Nomad system job registered in Consul, with a gRPC health
# check: Nomad's native provider cannot run grpc checks, Consul's can.
# grpc_service = "" asks for the daemon's overall readiness.
#
# Everything else is as in phasegate.nomad.hcl, which explains it: the two
# surfaces (health on the port for the checks, the Slots API on the control
# socket /run/phasegate/control.sock for the node's orchestrator), TLS from
# Vault's pki secrets engine through the template (renewal = SIGHUP, an
# in-place upgrade that keeps the port and the slots), kill_timeout above
# the daemon's stop budget (20s with these flags) and under Nomad's default
# max_kill_timeout (30s), check_restart grace above --start-timeout plus the
# stop budget.
#
# Both checks speak TLS to the port. Consul's agent runs them; it verifies
# the certificate against its own CA settings (enable_agent_tls_for_checks)
# or the system's, which do not know Vault's pki CA: so tls_skip_verify. To
# verify, give the agent the CA and set tls_server_name to a name in the
# certificate.
job "phasegate" {
  type = "system"

  group "phasegate" {
    # The group's services are deregistered, then the tasks signalled
    # this long after.
    shutdown_delay = "5s"

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
        grpc_use_tls    = true
        tls_skip_verify = true
        interval        = "5s"
        timeout         = "2s"

        check_restart {
          limit           = 3
          grace           = "5m30s"
          ignore_warnings = false
        }
      }

      # Consul passes 2xx, warns on 429 and fails the rest: /health answers
      # 200 (pass or warn in its body) or 503 while not ready.
      check {
        name            = "phasegate-health"
        type            = "http"
        protocol        = "https"
        tls_skip_verify = true
        path            = "/health"
        interval        = "5s"
        timeout         = "2s"
      }
    }

    task "phasegate" {
      driver = "raw_exec"

      config {
        command = "/usr/local/bin/phasegate"
        args = [
          "serve",
          "--listen=${NOMAD_IP_api}:${NOMAD_PORT_api}",
          "--tls-cert=${NOMAD_SECRETS_DIR}/phasegate.pem",
          "--tls-key=${NOMAD_SECRETS_DIR}/phasegate.pem",
          "--state-dir=/run/phasegate",
          "--netns-dir=/run/netns",
          # A principal other than root may hold 256 leases at once, a
          # quarter of the 1024 slots, as the daemon has it when unset.
          "--max-leases=256",
          "--start-timeout=5m",
          "--drain-delay=2s",
          "--stop-timeout=3s",
        ]
      }

      vault {
        role        = "phasegate"
        change_mode = "noop"
      }

      template {
        data        = <<-EOT
          {{- with secret "pki/issue/phasegate" "common_name=phasegate.internal" (printf "ip_sans=%s" (env "NOMAD_IP_api")) "ttl=72h" }}
          {{ .Data.certificate }}
          {{ .Data.issuing_ca }}
          {{ .Data.private_key }}
          {{- end }}
        EOT
        destination   = "secrets/phasegate.pem"
        perms         = "0600"
        change_mode   = "signal"
        change_signal = "SIGHUP"
      }

      kill_signal  = "SIGTERM"
      kill_timeout = "25s"

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
