# phasegate as a Nomad system job: one daemon per client node, checked by
# Nomad's native service provider over HTTPS.
#
# The port answers within milliseconds of the start, 503 while the daemon
# classifies and reclaims slots and fills its pool, so the check says
# "starting", never "connection refused".
#
# Two surfaces (docs/SECURITY.md). The port, on the node's address, serves
# health, metrics and the phase views to Nomad's checks and anyone else:
# nothing there names a tenant or changes anything. The Slots API is on the
# control socket, /run/phasegate/control.sock on the client (mode 0660,
# root's): the node's orchestrator, a raw_exec task running as root like this
# one, uses it directly (`phasegate slots list` finds it); a task of another
# driver mounts a client host_volume of /run/phasegate. Over the port the
# Slots API answers only clients with a certificate that --tls-client-ca
# verifies (add it, and --allow=id:<uri|dns|cn>:<identity>=<owners> for each client,
# for an orchestrator off the node); without it, as here, every TCP client is
# refused: no host that reaches port 5008 can touch a slot.
#
# TLS. The daemon listens on the node's address, and it refuses to start on
# a non-loopback address without a certificate. The template below asks
# Vault's pki secrets engine for one, valid for this node's IP, and renders
# the certificate, its issuing CA and the private key into one file of the
# task's secrets directory, which --tls-cert and --tls-key both name: one
# issue call, so the key always matches the certificate. When the
# certificate is renewed the template re-renders it and sends SIGHUP, the
# daemon's in-place upgrade: same pid, the port, the lock and every slot
# kept, the new certificate loaded (a file the daemon cannot load makes the
# upgrade refuse, and the daemon keeps serving with the old one).
# Vault, once:
#   vault secrets enable pki
#   vault write pki/root/generate/internal common_name=phasegate-ca ttl=87600h
#   vault write pki/roles/phasegate allowed_domains=phasegate.internal \
#     allow_bare_domains=true allow_ip_sans=true max_ttl=168h
# and a policy for the task's role with: path "pki/issue/phasegate" { capabilities = ["update"] }
# Clients verify the daemon against that CA (the node's IP is in the
# certificate): phasegate probe --addr=<node ip>:5008 --tls-ca=ca.pem
# Without Vault: install the PEM files on every client and point --tls-cert
# and --tls-key at them (raw_exec reads host paths; a driver with its own
# filesystem needs a host_volume mounted into the task).
#
# Stop. Nomad sends kill_signal, waits kill_timeout, then SIGKILL. The
# daemon's worst-case orderly stop with these flags is printed by
# `phasegate serve <args> --check` as stop_budget_seconds: drain delay +
# 2 x stop timeout (the port) + one stop timeout for each of the three
# phases with a stop + one for the background tasks = 2s + 6 x 3s = 20s.
# kill_timeout (25s) exceeds it and stays under the 30s that Nomad clients
# allow by default (client max_kill_timeout caps every kill_timeout): larger
# --drain-delay/--stop-timeout need max_kill_timeout raised on every client.
# The group's shutdown_delay deregisters the service 5s before the signal,
# so callers that find the daemon through service discovery stop coming
# first (a task-level shutdown_delay would not deregister group services).
#
# A stop keeps every leased and warm slot (workloads keep running) and the
# records in /run/phasegate; the next start restores them. A job update that
# changes the task restarts it: the port is closed from the old daemon's
# stop to the new one's start (seconds); slots and workloads are untouched.
# To upgrade the binary without closing the port, replace
# /usr/local/bin/phasegate on the client and signal the task:
#   nomad alloc signal -s SIGHUP <alloc id> phasegate
#
# Nomad's native provider runs only http and tcp checks; for a gRPC check
# use the Consul variant, phasegate-consul.nomad.hcl.
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
      provider = "nomad"
      port     = "api"

      check {
        name     = "phasegate-health"
        type     = "http"
        protocol = "https"
        # Nomad's checker trusts the client host's system CAs, not Vault's
        # pki CA: skip verification (Nomad 1.9.6 and later honour it for
        # native checks), or add the CA to the hosts' trust store and drop
        # this line.
        tls_skip_verify = true
        path            = "/health"
        interval        = "5s"
        timeout         = "2s"

        check_restart {
          limit = 3
          # At least --start-timeout plus the stop budget (5m + 20s): the
          # daemon's own bound on its start acts first (it exits 1 naming
          # the phase that was slow, and Nomad restarts it).
          grace           = "5m30s"
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

      # The Vault token the template uses (Nomad 1.7+ workload identity:
      # the role's policy allows pki/issue/phasegate). A new token does not
      # need a new daemon: the template re-renders, which signals it.
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
