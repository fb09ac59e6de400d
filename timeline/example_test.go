package timeline_test

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/timeline"
)

// Render draws one snapshot as a self-contained HTML page: an SVG bar per
// phase on a shared time axis and a table of the same figures. A daemon
// serves it live with Handler (phasegate's App at /debug/startup); a
// report or a test renders a snapshot it kept.
func ExampleRender() {
	nop := func(context.Context, *lifecycle.Progress) error { return nil }
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "config", Run: nop},
		{Name: "migrate", DependsOn: []string{"config"}, Run: func(_ context.Context, p *lifecycle.Progress) error {
			p.SetTotal(20, "migrations")
			p.SetDone(20)
			return nil
		}},
		{Name: "serve", DependsOn: []string{"migrate"}, Run: nop},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := lc.Start(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	defer lc.Drain(context.Background())

	var page bytes.Buffer
	if err := timeline.Render(&page, lc.Snapshot(), lc.Events(0), time.Now(), timeline.Options{Title: "catalog"}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(regexp.MustCompile(`<title>(.*)</title>`).FindStringSubmatch(page.String())[1])
	fmt.Println(bytes.Contains(page.Bytes(), []byte("<svg")), bytes.Contains(page.Bytes(), []byte("<script")))
	fmt.Println(bytes.Contains(page.Bytes(), []byte("20/20 migrations")))
	// Output:
	// catalog — startup timeline
	// true false
	// true
}
