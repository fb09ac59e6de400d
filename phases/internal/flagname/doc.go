// Package flagname is the daemon's one table from the network layer's
// settings to its flags.
//
// The network layer takes values, never flags: a setting it cannot use is
// a *network.SettingError naming the Go field ("Guest.Tap" of
// slot.Config). What the daemon shows an operator (a configuration
// refused at start, a policy refused to a client) names the flag the
// operator sets instead ("--slot-guest-tap"): Shown rewrites each
// setting's name through the table.
package flagname
