// Package nftexpr builds the nftables expressions that the host's slot
// table and a slot's own tables both write.
//
// Package nft writes the one and package inside the others: a rule both
// sides hold then reads the same on each.
package nftexpr

import (
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
)

// CtState matches the replies and related packets of known connections.
func CtState() []expr.Any {
	return CtBits(expr.CtKeySTATE, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
}

// CtBits matches a connection whose conntrack key (state, status) has any
// bit of mask set.
func CtBits(key expr.CtKey, mask uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: key},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}
