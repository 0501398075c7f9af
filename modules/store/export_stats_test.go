package store

// OperatorSQL is the operator's reads that are not hot (envctl audit list),
// which TestUnanalyzedParentsPlanAsAnalyzed plans with and without parent
// statistics.
var OperatorSQL = map[string]string{
	"listAudit": listAuditSQL,
}
