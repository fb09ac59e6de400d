// Package rootdir is a directory only root controls, and the files in it
// opened without following a link.
//
// It is what the daemon's state directory, its lock directory and its
// control socket's directory must be, so that no other user can plant a name
// the daemon then opens, binds or renames (docs/SECURITY.md, "Files only
// root controls").
//
// # The rule
//
// A directory passes when it is a directory (not a link to one), owned by
// root, and writable by no one else: neither its group nor others may
// write it. Group search (0710, the control socket's group) is fine. A
// process that is not root may also own its directories itself, as sshd's
// StrictModes lets a user own theirs.
//
// Every directory above it, up to /, must be owned by root too and
// writable by no one else, or have the sticky bit (/tmp, /run/lock): there
// no user may rename or remove an entry it does not own, and the entry
// below is root's, so the path keeps naming the same directory. A link
// above it is followed when root owns it (/var/run). Without this, a user
// who can write a directory above could move the checked directory away
// and put one of its own at its path.
//
// A directory under a sticky, world-writable one can still be made first
// by anyone, and is then refused: the defaults are directly under /run,
// which only root writes.
//
// # Opening
//
// [Check] applies the rule to a path without changing anything (a
// configuration check). [Ensure] makes a missing directory (mkdir, then
// open it without following a link and check the descriptor: what was
// opened, not the path) and [Open] opens an existing one, both checked.
// A [Dir]'s files are opened relative to its descriptor with openat2
// RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH (openat with O_NOFOLLOW on a kernel
// without openat2), and names are single components: a link is never
// followed, it is a *[LinkError]. In a directory that passed the rule a
// link can only be root's; it is still refused, not followed.
package rootdir
