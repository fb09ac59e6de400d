package otelenv

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
)

// None is the exporter name that selects no exporter.
const None = "none"

// The OTLP protocols the Go exporters implement. The specification also
// names "http/json", which they do not.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// Disabled reports whether OTEL_SDK_DISABLED is "true". Unset or empty
// means false. Any value other than true or false is an error: the
// specification would have it read as false with a warning, and this
// package has nowhere to warn.
func Disabled() (bool, error) {
	const key = "OTEL_SDK_DISABLED"
	v := os.Getenv(key)
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, fmt.Errorf("%s=%q: want true or false", key, v)
}

// Exporters reads the comma-separated exporter list in the variable key and
// returns the names in the order given, lower-cased, without repeats or
// empty items. Unset, empty and "none" all return no name. A name not in
// known, or "none" beside another name, is an error.
func Exporters(key string, known ...string) ([]string, error) {
	v := os.Getenv(key)
	var names []string
	none := false
	for item := range strings.SplitSeq(v, ",") {
		name := strings.ToLower(strings.TrimSpace(item))
		switch {
		case name == "":
		case name == None:
			none = true
		case !slices.Contains(known, name):
			return nil, fmt.Errorf("%s=%q: unknown exporter %q: want a comma-separated list of %s, or %s",
				key, v, name, strings.Join(known, ", "), None)
		case !slices.Contains(names, name):
			names = append(names, name)
		}
	}
	if none && len(names) > 0 {
		return nil, fmt.Errorf("%s=%q: %q cannot be listed with other exporters", key, v, None)
	}
	return names, nil
}

// Protocol returns the OTLP protocol for a signal ("TRACES", "METRICS"):
// OTEL_EXPORTER_OTLP_<signal>_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// else http/protobuf. A protocol the exporters do not speak is an error
// naming the variable it came from.
func Protocol(signal string) (string, error) {
	for _, key := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		v := os.Getenv(key)
		switch p := strings.ToLower(strings.TrimSpace(v)); p {
		case "":
			continue
		case ProtocolGRPC, ProtocolHTTPProtobuf:
			return p, nil
		default:
			return "", fmt.Errorf("%s=%q: unsupported OTLP protocol %q: want %s or %s",
				key, v, p, ProtocolGRPC, ProtocolHTTPProtobuf)
		}
	}
	return ProtocolHTTPProtobuf, nil
}

// NotLinked is the error for an exporter the variable key names, which the
// specification knows, but which the binary was built without: pkg is the
// package of this module that provides it, and field the app.Config field
// an App is given it in ("TraceExporters"); a program on the packages
// alone gives it to pkg's parent's Setup.
func NotLinked(key, name, pkg, field string) error {
	return fmt.Errorf("%s=%q: exporter %q is not in this binary: build it with package %s and give its Exporter in app.Config.%s (or, without an App, to %s.Setup)",
		key, os.Getenv(key), name, "github.com/phasegate/phasegate/"+pkg, field, path.Dir(pkg))
}
