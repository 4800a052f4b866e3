// placeholder until the plan layer lands
namespace moetrain {}
