// The table of recipes (recipes/recipe_list.cpp); read it through all_recipes() in recipes/registry.h.
#pragma once

#include <vector>

#include "recipes/registry.h"

namespace ingot::recipes {

std::vector<Recipe> make_recipe_list();

}  // namespace ingot::recipes
