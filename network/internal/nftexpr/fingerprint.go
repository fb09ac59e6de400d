package nftexpr

import (
	"strings"

	"github.com/google/nftables/userdata"
)

// fingerprintPrefix starts the comment of a policy's first rule, in the
// host's egress chain of a slot and in the slot's own egress table alike.
const fingerprintPrefix = "policy "

// FingerprintComment is the user data of a policy's first rule: a comment
// carrying the policy's fingerprint (egress.Policy.Fingerprint), which
// Fingerprint reads back, so that a restart compares what is written with
// what is recorded.
func FingerprintComment(fingerprint string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, fingerprintPrefix+fingerprint)
}

// Fingerprint is the fingerprint a rule's user data carries
// (FingerprintComment); "" for a rule without a comment.
func Fingerprint(ud []byte) string {
	comment, ok := userdata.GetString(ud, userdata.TypeComment)
	if !ok {
		return ""
	}
	fp, _ := strings.CutPrefix(comment, fingerprintPrefix)
	return fp
}
