// Package statmode names the type of a file from its stat mode, for the
// errors that refuse a path for what it is ("a directory", "a socket").
//
// One table, so that every refusal words a type the same way.
package statmode
