// Command empty is plugincost's floor: a Go binary that links nothing.
package main

func main() {}
