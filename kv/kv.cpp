// Module kv: placeholder translation unit until the module's first source lands.
