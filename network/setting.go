package network

// SettingError is a setting of the network layer that cannot be used. The
// network layer takes values, never flags: Setting names the value as its
// package's Go field does ("Guest.Tap" of slot.Config, "ProxyPort" of
// egress.Defaults), and a program that reads the setting from a flag or a
// file of its own shows its operator that name instead (the daemon maps
// each to its flag in one table). Problem says what is wrong, after the
// name.
type SettingError struct {
	Setting string
	Problem string
}

// Error is the setting's Go name, then its problem.
func (e *SettingError) Error() string { return e.Setting + " " + e.Problem }

// Shown is the error as an operator reads it, the setting called name.
func (e *SettingError) Shown(name string) string { return name + " " + e.Problem }
