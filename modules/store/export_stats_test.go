package store

// OperatorSQL is the operator's reads that are not hot (envctl audit list),
// which TestUnanalyzedParentsPlanAsAnalyzed plans with and without parent
// statistics: one project's page, and a window of one outcome across the
// tenant's projects.
var OperatorSQL = map[string]string{
	"listAudit": listAuditQuery(renderDB, (*auditModel)(nil),
		auditQueryArgs{tenant: param(1), project: param(2), limit: 100}).String(),
	"listAudit (window)": listAuditQuery(renderDB, (*auditModel)(nil),
		auditQueryArgs{tenant: param(1), since: param(2), until: param(3), outcome: param(4), limit: MaxAuditLimit}).String(),
}
