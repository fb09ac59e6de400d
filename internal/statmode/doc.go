// Package statmode names the type of a file from the type bits of its stat
// mode, for the errors that refuse a path because of what it is ("a
// directory", "a socket"): one table, so that every refusal words a type
// the same way.
package statmode
