package envelope

// Contract limits for one document (section 1 of controlplane/v1). They are
// ceilings: callers may tighten them, never loosen them.
const (
	// MaxDocumentBytes is the byte limit of a document, white space
	// included; it is also the limit of a whole request body, a batch's too.
	MaxDocumentBytes = 1 << 20
	defaultMaxDepth  = 64
	defaultMaxItems  = 10000
)

// MaxPageBytes bounds the envelope JSON of one stream page (contract §8.2):
// four envelopes of the largest size, so a reader of large envelopes still
// gets several per request while what a page makes the server and the
// reader hold stays bounded. A page always carries its first envelope,
// whatever its size.
const MaxPageBytes = 4 * MaxDocumentBytes

// Limits bounds what the reader accepts. MaxBytes counts the raw input,
// white space included. MaxDepth counts containers: a top-level object or
// array is depth 1 and scalars add none. MaxItems counts every array element
// and every object member over the whole document.
type Limits struct {
	MaxBytes, MaxDepth, MaxItems int
}

// DefaultLimits returns the contract's limits: 1 MiB, depth 64, 10,000 items.
func DefaultLimits() Limits {
	return Limits{MaxBytes: MaxDocumentBytes, MaxDepth: defaultMaxDepth, MaxItems: defaultMaxItems}
}

// Tighten returns l with every field of o that is positive and smaller than
// l's applied. A zero or negative field in o means "no opinion", so an options
// struct with only some fields set never loosens or disables the others, and
// no value of o can make a limit larger.
func (l Limits) Tighten(o Limits) Limits {
	if o.MaxBytes > 0 && o.MaxBytes < l.MaxBytes {
		l.MaxBytes = o.MaxBytes
	}
	if o.MaxDepth > 0 && o.MaxDepth < l.MaxDepth {
		l.MaxDepth = o.MaxDepth
	}
	if o.MaxItems > 0 && o.MaxItems < l.MaxItems {
		l.MaxItems = o.MaxItems
	}
	return l
}

// effective is what every public entry point applies: the contract's limits
// tightened by whatever the caller passed. Passing a looser Limits value can
// therefore never relax the contract.
func effective(l Limits) Limits {
	return DefaultLimits().Tighten(l)
}
