// Output shape rules, shared by the declaration's own check (decl_validate.cpp) and their
// evaluation (shape_rules.cpp). Not installed: eval_dim and output_shape are the public side.
#pragma once

#include <string>
#include <vector>

#include "opbridge/op_decl.h"

namespace opbridge::detail {

// The postfix expressions of a rule's dimensions; on a malformed rule, *error says why.
std::vector<std::vector<DimTerm>> parse_shape_rule(const OpDecl& decl, const std::string& rule, std::string* error);

}  // namespace opbridge::detail
