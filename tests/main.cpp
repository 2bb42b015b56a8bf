// The Boost.Test entry point of `ember_tests`; each tests/test_<suite>.cpp adds one suite.
#define BOOST_TEST_MODULE ember
#include <boost/test/unit_test.hpp>
