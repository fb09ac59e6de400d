// Command trivialhttp is the first-answer benchmark's baseline (issue 48,
// item 1): the least a Go program does to answer GET /health, net/http and
// one handler, listening on the address given as its only argument. What
// phasegate takes beyond it before its first answer is phasegate's own.
package main

import (
	"log"
	"net/http"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: trivialhttp ADDR")
	}
	http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	log.Fatal(http.ListenAndServe(os.Args[1], nil))
}
