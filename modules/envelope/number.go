package envelope

import (
	"math"
	"strconv"
)

// appendES6 formats a finite double as ECMAScript's Number.prototype.toString
// does, which is what RFC 8785 section 3.2.2.3 prescribes: the shortest
// round-tripping digits, plain notation for 1e-6 <= |f| < 1e21, exponent
// notation with an explicit sign and no padding otherwise, and -0 as "0".
// Go's shortest formatting yields the same digits; only the exponent's
// zero padding differs ("1e-07" vs "1e-7").
func appendES6(out []byte, f float64) []byte {
	if f == 0 {
		return append(out, '0')
	}
	abs := math.Abs(f)
	if abs >= 1e-6 && abs < 1e21 {
		return strconv.AppendFloat(out, f, 'f', -1, 64)
	}
	start := len(out)
	out = strconv.AppendFloat(out, f, 'e', -1, 64)
	// Go always writes at least two exponent digits; ECMAScript writes the
	// minimum. Exponents here are >= 21 or <= -7, so only e-07..e-09 pad.
	n := len(out)
	if n-start >= 4 && out[n-4] == 'e' && out[n-2] == '0' {
		out[n-2] = out[n-1]
		out = out[:n-1]
	}
	return out
}
