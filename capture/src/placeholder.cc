// Placeholder so the library has a translation unit until its sources land.
