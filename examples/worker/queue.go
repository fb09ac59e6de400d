package main

// The job queue's protocol, over HTTP with JSON bodies:
//
//	GET  /healthz            200 while the queue takes workers
//	GET  /jobs/next          200 and a Job, or 204 when there is none
//	POST /jobs/{id}/result   a Result; 204 once recorded

// Job is one unit of work.
type Job struct {
	ID   string `json:"id"`
	Text string `json:"text"`
}

// Result is what the worker found in a job's text.
type Result struct {
	Words  int    `json:"words"`
	SHA256 string `json:"sha256"`
}
