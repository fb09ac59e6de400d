package flagname

import (
	"errors"
	"strings"

	"github.com/phasegate/phasegate/network"
)

// flags names the daemon's flag for each setting of the network layer
// that an error of it may name.
var flags = map[string]string{
	"CIDR":          "--slot-cidr",
	"CIDR6":         "--slot-cidr6",
	"Guest.Tap":     "--slot-guest-tap",
	"Guest.Addr":    "--slot-guest-addr",
	"Guest.Gateway": "--slot-guest-gateway",
	"Guest.MAC":     "--slot-guest-mac",
	"ProxyPort":     "--slot-egress-proxy-port",
}

// Of is the flag of setting, or the setting itself when no flag sets it.
func Of(setting string) string {
	if f, ok := flags[setting]; ok {
		return f
	}
	return setting
}

// Shown is err's message as the daemon shows it: the setting a
// *network.SettingError in its chain names, called by its flag.
func Shown(err error) string {
	msg := err.Error()
	var se *network.SettingError
	if errors.As(err, &se) {
		msg = strings.Replace(msg, se.Error(), se.Shown(Of(se.Setting)), 1)
	}
	return msg
}
